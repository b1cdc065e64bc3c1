"""The data of the worked examples for other tasks than image classification (docs/extending.md):
one module per task, each with its loader and a function that writes synthetic data as files."""
