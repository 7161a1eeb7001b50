"""Private speed internals of the families and the training loop (not public API: names and behaviour may change).
Each module cites the A/B measurement that justifies it."""
