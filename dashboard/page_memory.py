"""Memory: weights / activations / KV cache / fragmentation, allocator state over time."""

from diagnose.dashboard import views

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    views.chart_page("Memory", tables=[("Memory breakdown", "memory_breakdown"),
                                       ("Allocator segments", "memory_segments")])
