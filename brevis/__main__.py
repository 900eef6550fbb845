import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while still importing: nothing was started
    sys.stderr.write("brevis: interrupted\n")
    sys.exit(130)

main()
