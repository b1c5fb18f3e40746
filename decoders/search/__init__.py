"""Family ``search``: beam search and its variants, sampling-and-reranking, MBR and
entropy-triggered rollouts, one module per decoder.

The beam decoders keep several hypotheses in one batched KV cache (batch = hypotheses), so
each step is one forward pass of the model over all of them, and each step is a ``beam`` step
whose ``beams`` list shows every hypothesis with its score and its parent in the previous
step's list.
"""

from __future__ import annotations

from decoders.search._beam import BatchState, BeamGroup, Hyp, finish_reason_of, group_beam_search, hits_stop
from decoders.search._parallel import Samples, iid_chooser, length_normalised, parallel_samples
from decoders.search.arithmetic import Arithmetic, arithmetic_codes, cdf_interval
from decoders.search.beam import Beam, DiverseBeam
from decoders.search.best_first import BestFirstBeam
from decoders.search.best_of_n import BestOfN
from decoders.search.mbr import MBR, ngram_f1
from decoders.search.rollouts import CNTP, AdaDec
from decoders.search.uid_beam import UidBeam

__all__ = [
    "AdaDec", "Arithmetic", "BatchState", "CNTP", "Beam", "BeamGroup", "BestFirstBeam", "BestOfN", "DiverseBeam", "Hyp", "MBR", "Samples",
    "arithmetic_codes", "cdf_interval", "finish_reason_of", "group_beam_search", "hits_stop", "iid_chooser",
    "length_normalised", "ngram_f1", "parallel_samples", "UidBeam",
]
