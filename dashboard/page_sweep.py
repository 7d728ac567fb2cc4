"""Sweep: throughput and p99 against concurrency from `diagnose sweep --format json`, and the knee."""

from diagnose.dashboard import documents

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    documents.sweep_page()
