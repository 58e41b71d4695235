"""The benchmark arms, read from arms.json (data, not code), and the
actplace-compile flags each one builds with. Module names are checked
against the compiler's own listing (modules.py), so the file cannot name
a module the compiler does not have."""
import json
import os
import typing

from . import profiles

ARMS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "arms.json")

KEYS = {"name", "what", "recompute", "offload", "goal", "profile", "flags",
        "default", "shape"}
SHAPE_KEYS = ("micro_batch_size", "micro_batches")
GOALS = ("activation-cut", "memory-budget", "step-budget")
# Flags the arm's own fields spell: a copy in "flags" could disagree.
FIELD_FLAGS = ("--recompute-modules", "--offload-modules", "--profile") + \
    tuple("--" + g for g in GOALS)


class Arm(typing.NamedTuple):
    name: str
    what: str
    recompute: list
    offload: object        # a list of module names, or "rest"
    goal: str              # "" or e.g. "activation-cut=0.6"
    profile: str           # "" or a device name (bench/profiles/NAME.json)
    flags: list
    default: bool
    # (micro_batch_size, micro_batches) of its own, or None: the build's.
    # The tokens a step must be the build's (build refuses other shapes).
    shape: typing.Optional[tuple] = None


class ArmTable(typing.NamedTuple):
    arms: dict             # name -> Arm, in file order
    frontier_sets: list
    leaf_cost_set: list

    @property
    def default(self):
        return [a.name for a in self.arms.values() if a.default]

    def get(self, name):
        if name not in self.arms:
            raise KeyError(f"unknown arm '{name}' (known: "
                           f"{', '.join(self.arms)})")
        return self.arms[name]


def _strings(value, where):
    if not isinstance(value, list) or \
            not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: expected a list of non-empty strings, "
                         f"got {value!r}")
    return value


def parse(data, source=ARMS_FILE, profiles_dir=None):
    """An ArmTable from the decoded JSON `data`. Errors name `source`, the
    arm and the field."""
    if not isinstance(data, dict) or not isinstance(data.get("arms"), list):
        raise ValueError(f"{source}: expected an object with a list 'arms'")
    arms = {}
    for i, entry in enumerate(data["arms"]):
        where = f"{source}: arms[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: 'name' must be a non-empty string")
        where = f"{source}: arm '{name}'"
        unknown = sorted(set(entry) - KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown field '{unknown[0]}' (known: "
                             f"{', '.join(sorted(KEYS))})")
        if name in arms:
            raise ValueError(f"{where}: given twice")
        if not isinstance(entry.get("what"), str) or not entry["what"]:
            raise ValueError(f"{where}: 'what' must say what the arm is")
        recompute = _strings(entry.get("recompute", []),
                             where + ": 'recompute'")
        offload = entry.get("offload", [])
        if offload != "rest":
            offload = _strings(offload, where + ": 'offload' (or \"rest\")")
        goal = entry.get("goal", "")
        if goal:
            if not isinstance(goal, str) or "=" not in goal or \
                    goal.split("=", 1)[0] not in GOALS:
                raise ValueError(f"{where}: 'goal' must be one of "
                                 f"{', '.join(g + '=...' for g in GOALS)}, "
                                 f"got {goal!r}")
            if recompute or offload:
                raise ValueError(f"{where}: a 'goal' arm names no modules "
                                 "(the compiler chooses them)")
        profile = entry.get("profile", "")
        if profile:
            if not isinstance(profile, str):
                raise ValueError(f"{where}: 'profile' must be a device name")
            path = profiles.path(profile, profiles_dir)
            if not os.path.exists(path):
                raise ValueError(f"{where}: profile '{profile}': no such "
                                 f"file {path}")
        flags = _strings(entry.get("flags", []), where + ": 'flags'")
        for flag in flags:
            if flag.split("=", 1)[0] in FIELD_FLAGS:
                raise ValueError(f"{where}: flag '{flag}' belongs in the "
                                 "arm's own field (recompute, offload, goal "
                                 "or profile)")
        default = entry.get("default", False)
        if not isinstance(default, bool):
            raise ValueError(f"{where}: 'default' must be true or false")
        shape = None
        if "shape" in entry:
            sh = entry["shape"]
            if not isinstance(sh, dict) or set(sh) != set(SHAPE_KEYS) or \
                    not all(type(sh[k]) is int and sh[k] >= 1
                            for k in SHAPE_KEYS):
                raise ValueError(f"{where}: 'shape' must be an object of "
                                 "positive integers micro_batch_size and "
                                 f"micro_batches, got {sh!r}")
            shape = (sh["micro_batch_size"], sh["micro_batches"])
        arms[name] = Arm(name, entry["what"], recompute, offload, goal,
                         profile, flags, default, shape)
    sets = [_strings(s, f"{source}: frontier_sets[{i}]") if s else []
            for i, s in enumerate(data.get("frontier_sets", []))]
    leaf_cost = _strings(data.get("leaf_cost_set", []),
                         f"{source}: leaf_cost_set")
    return ArmTable(arms, sets, leaf_cost)


def shape_of(arm, micro_batch_size, micro_batches, seq):
    """The (micro_batch_size, micro_batches) `arm` builds with: its own shape
    or the build's. An own shape must keep the build's tokens a step
    (micro_batch_size x micro_batches x seq), so every arm of a run trains
    on the same tokens and their step times compare."""
    if arm.shape is None:
        return micro_batch_size, micro_batches
    mbs, mb = arm.shape
    if mbs * mb != micro_batch_size * micro_batches:
        raise ValueError(
            f"arm '{arm.name}': shape {mb} x {mbs} is {mbs * mb * seq} tokens "
            f"a step, the build's {micro_batches} x {micro_batch_size} is "
            f"{micro_batch_size * micro_batches * seq}")
    return mbs, mb


def load(path=ARMS_FILE, profiles_dir=None):
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON: {e}") from None
    return parse(data, path, profiles_dir)


def recompute_offload_rest(rc, modules):
    """Placement flags: recompute the leaves (or aliases) `rc`, offload every
    other leaf the compiler lists (the hide rule keeps what cannot hide)."""
    kept = set(modules.expand(rc, "recompute set"))
    return ((["--recompute-modules=" + ",".join(rc)] if rc else []) +
            ["--offload-modules=" + ",".join(
                l for l in modules.leaves if l not in kept)])


def flags(arm, modules, profiles_dir=None):
    """actplace-compile placement flags of `arm` (an Arm). Every module name
    must be in the compiler's listing `modules` (modules.Modules)."""
    what = f"arm '{arm.name}'"
    out = []
    if arm.offload == "rest":
        out += recompute_offload_rest(arm.recompute, modules)
    else:
        modules.expand(arm.recompute, what + ": recompute")
        modules.expand(arm.offload, what + ": offload")
        if arm.recompute:
            out.append("--recompute-modules=" + ",".join(arm.recompute))
        if arm.offload:
            out.append("--offload-modules=" + ",".join(arm.offload))
    if arm.goal:
        out.append("--" + arm.goal)
    if arm.profile:
        out.append("--profile=" + profiles.path(arm.profile, profiles_dir))
    return out + list(arm.flags)


def check(table, modules):
    """Every arm and set of `table` against the compiler's listing: the
    first unknown module raises modules.UnknownModule naming the arm."""
    for arm in table.arms.values():
        flags(arm, modules)
    for i, s in enumerate(table.frontier_sets):
        modules.expand(s, f"frontier_sets[{i}]")
    modules.expand(table.leaf_cost_set, "leaf_cost_set")
