import sys

# `python3 -m toa COMMAND`: the seeds' commands (toa.cli); without one, a component's program.
if len(sys.argv) > 1:
    from .cli import COMMANDS, USAGE, main as commands

    if sys.argv[1] not in COMMANDS:
        print(f"toa: unknown command {sys.argv[1]!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    sys.exit(commands(sys.argv[1:]))
else:
    from .runtime import main

    main()
