"""The interactive Streamlit report (a later issue)."""
