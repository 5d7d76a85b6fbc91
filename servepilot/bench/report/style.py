"""The stylesheet every servepilot HTML report starts from (bench's and tune's): page, headings,
the metadata table, the highlighted verdict box, the runs table's frame, notes and SVG charts.
Each report appends the rules of its own sections."""

from __future__ import annotations

BASE_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 color:#1d1d1f;margin:24px auto;max-width:1180px;padding:0 16px}
h1{font-size:22px;margin:0 0 10px}h2{font-size:17px;margin:28px 0 8px;
 border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse}
.meta th{text-align:left;color:#555;font-weight:600;padding:2px 14px 2px 0;vertical-align:top}
.meta td{padding:2px 0}
.sweet{background:#e8f5ec;border-left:5px solid #1b7a3a;padding:10px 14px;margin:16px 0}
.sweet .label{font-size:12px;text-transform:uppercase;color:#1b7a3a;font-weight:700}
.sweet .reason{color:#333;margin-top:4px}
.scroll{overflow-x:auto}
.runs{font-size:12.5px;font-variant-numeric:tabular-nums;width:100%}
.runs tr.spot td{background:#e8f5ec;font-weight:600}
.note{color:#666;font-size:12px;margin:6px 0}
svg.chart{max-width:100%;height:auto;font-family:inherit}
svg .grid{stroke:#e6e6e6}svg text{fill:#333}svg .title{font-size:13px;font-weight:600}
svg .axis{fill:#555}
svg .ref{font-size:11px;font-weight:600;stroke:#fff;stroke-width:3px;paint-order:stroke}
"""
