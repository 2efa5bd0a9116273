"""Figures and tables shared by the analysis commands, and the run report (`report.html.write_html_report`)."""
