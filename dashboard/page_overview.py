"""Overview: the verdict, ranked findings with evidence and fixes, capture health, inputs."""

from diagnose.dashboard import views

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    views.overview()
