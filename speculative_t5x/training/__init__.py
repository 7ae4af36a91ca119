"""Training on a seqio task: networks (`train`) and drafts distilled from their target (`distill`)."""
