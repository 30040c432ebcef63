"""ddp_impl.runtime."""
