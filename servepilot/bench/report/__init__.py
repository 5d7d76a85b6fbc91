"""Building blocks of the bench report: number formats, table columns, SVG charts, sections.

`servepilot.bench.report.html.write_html_report` puts them together into one HTML file.
"""
