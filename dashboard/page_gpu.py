"""GPU: busy vs idle, the busy timeline of a trace, idle gaps, top kernels, copies (NVML, Nsight, PyTorch traces)."""

from diagnose.dashboard import views

if __name__ == "__main__":  # Streamlit runs each page as __main__; importing it does nothing
    views.chart_page("GPU", tables=[("Processes on the GPU (last NVML sample)", "gpu_processes"),
                                    ("Busy time per device (Nsight)", "gpu_busy"),
                                    ("Ranks side by side (PyTorch-profiler traces, HTA's breakdown)", "trace_ranks")])
