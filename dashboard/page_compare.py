"""Compare: two sessions before/after a change: measurements, findings gained and lost."""

from diagnose.dashboard import views

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    views.compare_page()
