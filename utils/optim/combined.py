"""Parameter groups stepped by different torch.optim algorithms, as one optimizer
(optimizer.param_groups[].optimizer): e.g. Muon for the convolution filters and SGD for the
rest, as the CIFAR-10 speed records train. docs/config.md#optimizer has the keys."""

from collections.abc import Callable

import torch

# torch.optim.Muon, on the torch versions that have it (2.9 and later).
MUON: type | None = getattr(torch.optim, "Muon", None)


def as_matrix(tensor: torch.Tensor) -> torch.Tensor:
    """tensor (out, ...) as a matrix (out, rest) in its logical order, whatever its memory
    layout: a convolution's filters (out, in, kh, kw), one filter a row. A view where the
    memory allows it (contiguous), else a copy (channels_last)."""
    return tensor.reshape(len(tensor), -1)


def combine(
    groups: list[dict], algorithms: list[type[torch.optim.Optimizer]], kwargs: dict[type, dict]
) -> "CombinedOptimizer":
    """groups[i] stepped by algorithms[i], each algorithm built once over its groups with
    kwargs[algorithm] (its options' defaults fill the groups, as torch's constructors do)."""
    filled: list[dict] = [{} for _ in groups]
    parts = []
    for algorithm in dict.fromkeys(algorithms):  # in order of first use
        indices = [index for index, used in enumerate(algorithms) if used is algorithm]
        mine = [groups[index] for index in indices]
        if (
            MUON is not None and algorithm is MUON
        ):  # built over the matrices; the groups keep the params
            matrices = [{**group, "params": matrix_views(group["params"])} for group in mine]
            optimizer = algorithm(matrices, **kwargs[algorithm])
            built = [
                {**made, "params": group["params"]}
                for made, group in zip(optimizer.param_groups, mine, strict=True)
            ]
        else:
            optimizer = algorithm(mine, **kwargs[algorithm])
            built = optimizer.param_groups
        for index, group in zip(indices, built, strict=True):
            filled[index] = group
        parts.append((optimizer, indices))
    return CombinedOptimizer(filled, parts)


def matrix_views(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [as_matrix(param.detach()) for param in params]


def takes_matrices(optimizer: torch.optim.Optimizer) -> bool:
    return MUON is not None and isinstance(optimizer, MUON)


class CombinedOptimizer(torch.optim.Optimizer):
    """One optimizer whose parameter groups are stepped by several: the state, the groups and
    state_dict() are those of an ordinary torch optimizer (checkpoints, resume by parameter
    name, schedulers and GradScaler see one), and step() runs each algorithm on its groups.

    `parts`: (optimizer, indices of this optimizer's groups in param_groups). torch.optim.Muon
    takes matrices only: its groups' parameters with more than two dimensions are handed to it,
    at each step, as matrices (out, rest) (as_matrix), with their gradients alike.
    """

    def __init__(
        self, groups: list[dict], parts: list[tuple[torch.optim.Optimizer, list[int]]]
    ) -> None:
        super().__init__(groups, {})
        self.parts = parts
        # What a scheduler asks of "the optimizer's" options (OneCycleLR's cycle_momentum): the
        # first group's algorithm's (optimizer.type's when a parameter is in no group).
        self.defaults = parts[0][0].defaults
        self.link()

    def link(self) -> None:
        """The parts' groups are this optimizer's own group dicts (a scheduler's change to a
        learning rate reaches them); their state is this optimizer's, keyed by parameter."""
        for optimizer, indices in self.parts:
            if takes_matrices(optimizer):
                continue  # its groups are built at each step (matrix views)
            optimizer.param_groups = [self.param_groups[index] for index in indices]
            optimizer.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # replaces the group dicts and the state
        self.link()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer, indices in self.parts:
            if takes_matrices(optimizer):
                updated = self.hand_matrices(optimizer, indices)
                optimizer.step()
                for param, matrix in updated:  # a copy (channels_last): back into the param
                    if matrix.data_ptr() != param.data_ptr():
                        param.copy_(matrix.view(param.shape))
            else:
                optimizer.step()
        return loss

    def hand_matrices(
        self, muon: torch.optim.Optimizer, indices: list[int]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Muon's groups as matrices (out, rest) of this optimizer's groups' parameters and
        gradients, and its state as theirs (a momentum buffer is such a matrix, in the same
        order whatever the memory layout: a checkpoint resumes with or without channels_last).
        Built at each step, so never stale. Returns the (parameter, matrix) pairs."""
        groups, state, pairs = [], {}, []
        for index in indices:
            group = self.param_groups[index]
            matrices = []
            for param in group["params"]:
                matrix = as_matrix(param.detach())
                matrix.grad = None if param.grad is None else as_matrix(param.grad)
                state[matrix] = self.state[param]
                matrices.append(matrix)
                pairs.append((param, matrix))
            groups.append({**group, "params": matrices})
        muon.param_groups, muon.state = groups, state
        return pairs


def state_shape(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> torch.Size:
    """The shape of the per-parameter tensors (momentum) `optimizer` keeps for `param`: its own,
    or under Muon the matrix's (out, rest)."""
    if isinstance(optimizer, CombinedOptimizer):
        for part, indices in optimizer.parts:
            mine = (p for index in indices for p in optimizer.param_groups[index]["params"])
            if takes_matrices(part) and any(p is param for p in mine):
                return torch.Size((len(param), param.numel() // len(param)))
    return param.shape
