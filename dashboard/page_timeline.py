"""Timeline: GPU utilisation, PCIe, CPU per process, in-flight requests, with event markers."""

from diagnose.dashboard import views

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    views.chart_page("Timeline", tables=[("Events", "events")])
