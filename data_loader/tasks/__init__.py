"""The worked examples of other task shapes: one module per task, each with its loader and a
write_* function that writes its synthetic data as files (docs/extending.md)."""
