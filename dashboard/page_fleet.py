"""Fleet: every replica's verdict from `diagnose fleet --format json`, the replicas × findings map, outliers,
and one replica's series."""

from diagnose.dashboard import documents

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    documents.fleet_page()
