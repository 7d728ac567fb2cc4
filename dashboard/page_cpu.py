"""CPU profile: py-spy samples by activity, process, thread and frame."""

from diagnose.dashboard import views

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    views.chart_page("CPU profile")
