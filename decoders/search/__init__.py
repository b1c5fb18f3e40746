"""Family ``search``: beam search and its variants, sampling-and-reranking, MBR and
entropy-triggered rollouts, one module per decoder.

The beam decoders keep several hypotheses in one batched KV cache (batch = hypotheses), so
each step is one forward pass of the model over all of them, and each step is a ``beam`` step
whose ``beams`` list shows every hypothesis with its score and its parent in the previous
step's list.
"""

from __future__ import annotations

from decoders.base import declare_family
from decoders.beam_batch import BatchState, BeamGroup, Hyp, finish_reason_of, group_beam_search, hits_stop
from decoders.search._parallel import Samples, iid_chooser, length_normalised, parallel_samples
from decoders.search.arithmetic import Arithmetic, arithmetic_codes, cdf_interval
from decoders.search.beam import Beam, DiverseBeam
from decoders.search.best_first import BestFirstBeam
from decoders.search.best_of_n import BestOfN
from decoders.search.mbr import MBR, ngram_f1
from decoders.search.rollouts import CNTP, AdaDec
from decoders.search.uid_beam import UidBeam


declare_family(
    "search", "Search",
    order=20, force_mode="view",
    primer="""\
Search keeps several partial outputs (beams) per step and returns the best finished one, so a
step is a **beam step**: its plot is the *Beam tree* (each beam's tokens, scores and parent,
finished hypotheses marked) and the run plot the beams' scores. Sample-and-rank decoders
(`best_of_n`, `mbr`, `arithmetic`) draw complete candidates and pick one; their last step shows
the candidates and the scores that chose (*MBR utilities* for `mbr`). Uncertainty-triggered
decoders (`cntp`, `adadec`) are greedy token steps until the model's entropy crosses a
threshold, and there try several rollouts (*Rollouts*) and keep the most likely.

**Which one:** `beam` (equal to transformers' `generate(num_beams=k)`) for the most probable
output a fixed budget finds; `diverse_beam` when the beams all say the same thing;
`uid_beam` to penalise uneven surprisal (*Surprisal curve*); `best_first_beam` for beam
search's answer from a priority queue (*Frontier and pops*), and with `recombine` a lattice
that merges hypotheses ending alike (*Lattice*); `cntp` and `adadec` to spend
search only where the model hesitates; `arithmetic` for diverse samples without duplicates;
`superposed` for k drafts from one forward pass per step (a superposition of their last tokens'
embeddings, k² candidates scored with n-gram statistics, *Candidate grid*);
`best_of_n` and `mbr` to spend compute on choosing among samples (mbr picks the candidate that
agrees most with the others).

**Knobs that matter:** `num_beams` (cost grows with it), `length_penalty` (> 0 favours long
outputs), `early_stopping`/`patience` (when the search counts as done), the number of candidates.""",
)

__all__ = [
    "AdaDec", "Arithmetic", "BatchState", "CNTP", "Beam", "BeamGroup", "BestFirstBeam", "BestOfN", "DiverseBeam", "Hyp", "MBR", "Samples",
    "arithmetic_codes", "cdf_interval", "finish_reason_of", "group_beam_search", "hits_stop", "iid_chooser",
    "length_normalised", "ngram_f1", "parallel_samples", "UidBeam",
]
