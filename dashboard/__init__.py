"""The interactive Streamlit + plotly report: ``diagnose dashboard SESSION…`` (see ``diagnose.dashboard.launch``).

The only package that imports streamlit. Pages hold presentation only; the tables and figures
come from ``diagnose.reports.data``, ``diagnose.reports.figures`` and ``diagnose.reports.compare``.
"""
