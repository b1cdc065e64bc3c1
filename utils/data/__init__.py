"""What batches, in which order: the epoch sampler, whose order is a function of (seed, epoch)
(sampler), an epoch's batches and resuming inside one (batches), the summary of the data a run
logs (data_summary). Machinery: a new data set is a loader in data_loader/, not a change here."""
