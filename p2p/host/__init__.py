"""The libp2p host: listening, dialling, bootstrap, per-peer fault scores and the trimming of idle connections."""
