"""Which device, how many processes: the process group and its collectives under torchrun
(process_group), the run's device and what each kind supports (device). Machinery: not edited
for a new task."""
