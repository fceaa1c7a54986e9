"""The former name of :mod:`fedwan_results` (benchmark results and federation
reports: rows, DataFrames, plots), kept so that code written against it, and
``python -m fedwan.results``, go on working. It loads the runtime (the
``fedwan`` package and its extension) first; ``import fedwan_results`` does
not, and is what new code should use.
"""

from __future__ import annotations

import sys

from fedwan_results import KINDS as KINDS
from fedwan_results import FormatError as FormatError
from fedwan_results import Row as Row
from fedwan_results import default_columns as default_columns
from fedwan_results import format_table as format_table
from fedwan_results import load as load
from fedwan_results import load_frame as load_frame
from fedwan_results import loads as loads
from fedwan_results import main as main
from fedwan_results import plot as plot
from fedwan_results import to_frame as to_frame

__all__ = ["FormatError", "KINDS", "Row", "default_columns", "format_table", "load",
           "load_frame", "loads", "main", "plot", "to_frame"]

if __name__ == "__main__":
    sys.exit(main())
