"""GPU: busy vs idle, idle gaps, top kernels, copies (NVML and Nsight data when present)."""

from dashboard import views

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    views.chart_page("GPU", tables=[("Processes on the GPU (last NVML sample)", "gpu_processes"),
                                    ("Busy time per device (Nsight)", "gpu_busy")])
