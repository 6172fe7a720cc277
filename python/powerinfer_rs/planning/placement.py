"""What goes where: the decision variables of a plan, per layer and global."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Placement:
    """One placement: per layer, whether attention (+ its KV cache) and the predictor are on the
    GPU and how many of the layer's neuron buckets (hottest first) are; whether the output head
    (+ final norm and logits) is. Embeddings always stay in CPU memory."""

    attention: list[bool]
    predictor: list[bool]
    ffn_buckets: list[int]
    output: bool = False

    @classmethod
    def cpu_only(cls, n_layers: int) -> Placement:
        """Nothing on the GPU."""
        return cls([False] * n_layers, [False] * n_layers, [0] * n_layers, False)

    @property
    def n_layers(self) -> int:
        """Number of layers."""
        return len(self.ffn_buckets)

    def layer_uses_gpu(self, layer: int) -> bool:
        """Whether any part of ``layer`` is on the GPU."""
        return bool(self.attention[layer] or self.predictor[layer] or self.ffn_buckets[layer] > 0)

    def uses_gpu(self) -> bool:
        """Whether anything is on the GPU (then the shared scratch buffers are allocated)."""
        return self.output or any(self.layer_uses_gpu(i) for i in range(self.n_layers))

    def key(self) -> tuple:
        """A hashable form (for tests and de-duplication)."""
        return (
            tuple(map(bool, self.attention)),
            tuple(map(bool, self.predictor)),
            tuple(map(int, self.ffn_buckets)),
            bool(self.output),
        )


__all__ = ["Placement"]
