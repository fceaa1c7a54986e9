"""``python -m fedwan ARGS...``: runs the ``fedwan`` command-line tool with ARGS.

The tool (``fedwan aggregator|site|demo|certs|audit``) is a C++ program that
links LibTorch; it is built and installed with the CMake build, not by pip.
It is looked for in ``$FEDWAN_CLI``, then on ``PATH``.
"""

import os
import shutil
import sys


def _find_cli():
    explicit = os.environ.get("FEDWAN_CLI")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        sys.exit(f"fedwan: FEDWAN_CLI={explicit!r} is not an executable file")
    found = shutil.which("fedwan")
    # A `fedwan` that is this very module's console script would call itself.
    if found and os.path.realpath(found) != os.path.realpath(sys.argv[0]):
        return found
    sys.exit("fedwan: the `fedwan` command-line tool is not on PATH. It is built by the "
             "CMake build (it links LibTorch): `cmake --install build --prefix PREFIX`, then "
             "add PREFIX/bin to PATH or set FEDWAN_CLI to the binary.")


def main():
    cli = _find_cli()
    os.execv(cli, [cli] + sys.argv[1:])


if __name__ == "__main__":
    main()
