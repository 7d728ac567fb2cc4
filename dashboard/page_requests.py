"""Requests: stage percentiles, slow-request waterfall, latency against input size, cold start."""

from diagnose.dashboard import views

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    views.chart_page("Requests", tables=[("Stage latency (ms)", "stage_stats")])
