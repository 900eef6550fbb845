import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while still importing: nothing was started
    from .interrupts import forget_unhandled

    forget_unhandled()
    sys.stderr.write("brevis: interrupted\n")
    sys.exit(130)

main()
