"""PPE's path ``training.extensions.print_report_notebook``.

``PrintReportNotebook`` is :class:`PrintReport`: its table prints the same in a notebook
(PPE's class needs IPython and ipywidgets; ours needs neither).
"""

from __future__ import annotations

from ppe_core.training.extensions._print_report import PrintReport
from ppe_core.training.extensions._print_report import PrintReport as PrintReportNotebook

__all__ = ["PrintReport", "PrintReportNotebook"]
