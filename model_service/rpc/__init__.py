"""The RPC layer: the servicer, the streams that write generations' logs, status mapping."""
