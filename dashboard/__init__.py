"""The interactive Streamlit + plotly report: ``diagnose dashboard SESSION…`` (see ``dashboard.launch``).

The only package that imports streamlit. Pages hold presentation only; the tables and figures
come from ``reports.data``, ``reports.figures`` and ``reports.compare``.
"""
