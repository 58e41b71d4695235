"""The module names placement flags accept, as the compiler lists them
(`actplace-import --list-modules`): the harness keeps no copy of the
table, so an arm naming a module the compiler does not know is refused
before anything is compiled."""
import os
import subprocess
import typing


class UnknownModule(ValueError):
    """A module name the compiler's listing does not have."""


class Modules(typing.NamedTuple):
    """Leaves in the compiler's order, each leaf's kind, and each alias's
    leaves."""
    leaves: list
    kinds: dict
    aliases: dict

    def expand(self, names, what="module list"):
        """Leaves of `names` (leaves or aliases), in the order given;
        UnknownModule naming the first unknown name and `what` it came
        from."""
        out = []
        for name in names:
            if name in self.kinds:
                out.append(name)
            elif name in self.aliases:
                out += self.aliases[name]
            else:
                raise UnknownModule(
                    f"{what}: unknown module '{name}' (the compiler knows: "
                    f"{', '.join(self.leaves)}; aliases: "
                    f"{', '.join(self.aliases)})")
        return out


def parse_listing(text, source="actplace-import --list-modules"):
    """Modules from the listing's lines: '<leaf> leaf <kind>' and
    '<alias> alias <leaf>,<leaf>,...'. A line of another form, an alias
    naming a leaf not listed, or an empty listing is an error naming the
    line."""
    leaves, kinds, aliases = [], {}, {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) == 3 and parts[1] == "leaf":
            leaves.append(parts[0])
            kinds[parts[0]] = parts[2]
        elif len(parts) == 3 and parts[1] == "alias":
            members = parts[2].split(",")
            missing = [m for m in members if m not in kinds]
            if missing:
                raise ValueError(f"{source}: line {number}: alias "
                                 f"'{parts[0]}' names unlisted leaves "
                                 f"{', '.join(missing)}")
            aliases[parts[0]] = members
        else:
            raise ValueError(f"{source}: line {number}: expected '<name> "
                             f"leaf <kind>' or '<name> alias <leaves>', got "
                             f"{line!r}")
    if not leaves:
        raise ValueError(f"{source}: no leaves listed")
    return Modules(leaves, kinds, aliases)


def from_tool(import_tool):
    """The listing of the actplace-import at `import_tool`."""
    if not os.path.exists(import_tool):
        raise FileNotFoundError(
            f"{import_tool}: no actplace-import there to list the module "
            "names (build it, or pass the build with --build-dir)")
    p = subprocess.run([import_tool, "--list-modules"], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{import_tool} --list-modules failed (exit "
                           f"{p.returncode}): {p.stderr.strip()}")
    return parse_listing(p.stdout, f"{import_tool} --list-modules")


def from_build(bin_dir):
    """The listing of the build whose tools are in `bin_dir`."""
    return from_tool(os.path.join(bin_dir, "actplace-import"))
