"""The diagnose dashboard: ``diagnose dashboard SESSION…`` (``python -m diagnose.dashboard.launch``) runs
``streamlit run`` on this script of the installed package.

This script only lays out the navigation and the sidebar's session selector; each page is a
small script (``page_*.py``) that calls ``diagnose.dashboard.views``. Nothing is read until a page runs.
"""

from __future__ import annotations

import streamlit as st

from diagnose.dashboard import state

PAGES = (
    # (script, title, url path, icon)
    ("page_overview.py", "Overview", "overview", ":material/fact_check:"),
    ("page_timeline.py", "Timeline", "timeline", ":material/timeline:"),
    ("page_requests.py", "Requests", "requests", ":material/schedule:"),
    ("page_cpu.py", "CPU profile", "cpu", ":material/memory:"),
    ("page_gpu.py", "GPU", "gpu", ":material/developer_board:"),
    ("page_memory.py", "Memory", "memory", ":material/storage:"),
    ("page_compare.py", "Compare", "compare", ":material/compare_arrows:"),
    ("page_fleet.py", "Fleet", "fleet", ":material/dns:"),
    ("page_sweep.py", "Sweep", "sweep", ":material/show_chart:"),
)


def main() -> None:
    st.set_page_config(page_title="diagnose", layout="wide")
    pages = [st.Page(script, title=title, url_path=url, icon=icon, default=i == 0)
             for i, (script, title, url, icon) in enumerate(PAGES)]
    nav = st.navigation(pages)
    paths = state.session_paths()
    names = state.labels(paths)
    if len(paths) > 1:
        st.sidebar.selectbox("Session", paths, format_func=names.__getitem__, key=state.StateKeys.SESSION)
    elif paths:
        st.sidebar.caption(f"Session: {names[paths[0]]}")
    nav.run()


main()
