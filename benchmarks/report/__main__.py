"""`python -m benchmarks.report RUN_DIR`: rewrite a study folder's report."""

from benchmarks.report.markdown import main

main()
