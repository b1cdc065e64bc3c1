"""How results are counted: exact sample-weighted metric sums over all ranks (metric_sums), the
confusion matrix (confusion), the best epoch and early stopping (monitor); and what export.py
needs of torch beside the traced graph (tracing). Machinery: a new metric is a function in
model/metric.py, not a change here."""
