"""How the optimizer moves: parameter groups, the weight decay of norms and biases, learning
rates scaled to the batch (optimizer), groups that train for their first epochs only
(group_epochs), schedules with warmup and what a resume needs of them (schedule), the moving
average of the weights (averaging). Machinery: choose an optimizer or a schedule in the config,
not here."""
