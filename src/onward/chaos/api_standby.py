"""A warm spare of ``onward api`` for ``onward chaos``:
``python -m onward.chaos.api_standby [API OPTIONS]``.

It imports everything the API needs, prints ``standby`` and waits for one line ``go NAME SPEC``
on stdin (SPEC ``point@n[,point@n]``, or ``-`` for none); then it arms the crash points
(``crashpoints.arm``, exactly what ``ONWARD_CRASH_AT`` does at import), prints ``go NAME
crash_at=SPEC`` and serves ``onward api [API OPTIONS]`` until SIGTERM. EOF instead of ``go``:
it exits. The chaos run restarts its API after every kill on the same port; a cold start
spends seconds importing (tens of seconds on a loaded machine), during which every click and
every reply is refused -- a spare only binds the port once told to go.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    import onward.api.app  # noqa: F401  (what a cold start spends its time on)
    from onward import cli, crashpoints

    print("standby", flush=True)
    line = sys.stdin.readline()
    if not line.startswith("go "):
        return 0  # EOF: not needed
    _, name, spec = line.split()
    if spec != "-":
        crashpoints.arm(spec)
    print(f"go {name} crash_at={spec}", flush=True)
    cli.main(["api", *args])
    return 0


if __name__ == "__main__":
    sys.exit(main())
