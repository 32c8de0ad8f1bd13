"""``python -m normlab …``: the same command-line interface as the ``normlab`` script."""

from normlab.cli import main

if __name__ == "__main__":
    main()
