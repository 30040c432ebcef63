"""DDP conformance kit: parity checks of data-parallel training against a
single-device reference, on CPU (gloo), PJRT and XRT runtimes."""
