"""Reports built from the runs' own output files (never from MLflow, so they do not depend on
tracking state): ``table.csv``/``table.md`` and the convergence figures."""

from mcfl.report.table import write_report

__all__ = ["write_report"]
