#===- e2echeck.py - what the e2e scripts share ------------------------------===#
#
# A check records its failure and goes on, so that one run of a script
# reports every failed check; the script exits nonzero at the end when any
# failed (exit_status). Imported by the scripts beside it (their folder is
# on sys.path when they run).
#
#===------------------------------------------------------------------------===#
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, flush=True)
    return cond


def exit_status(ok_message):
    """1 after printing the count of failures, else 0 after ok_message."""
    if failures:
        print(f"{len(failures)} failure(s)", flush=True)
        return 1
    print(ok_message, flush=True)
    return 0
