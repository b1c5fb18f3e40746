"""Links to the papers (or primary sources) behind every decoder, for ``docs/decoders.md``.

The decoder classes carry a free-text ``reference``; this table adds what a reader needs to
open the source: a citation and a stable URL (arXiv abstract, ACL Anthology, DOI or the
project's own page). Keyed by decoder name, so ``tests/test_papers.py`` can require an entry
with a link for every registered decoder. An entry with ``url=None`` is cited without a link
(a thesis with no stable online copy); every decoder still needs at least one linked source.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Paper(NamedTuple):
    """One source: how to cite it and where to read it (None: no stable link)."""

    cite: str
    url: str | None


def _arxiv(cite: str, arxiv_id: str) -> Paper:
    return Paper(cite, f"https://arxiv.org/abs/{arxiv_id}")


# Shared sources, named once so two decoders citing one paper cannot drift apart.
_LEVIATHAN = _arxiv("Leviathan et al. 2023, Fast Inference from Transformers via Speculative Decoding (ICML)", "2211.17192")
_CHEN = _arxiv("Chen et al. 2023, Accelerating Large Language Model Decoding with Speculative Sampling", "2302.01318")
_HEWITT = _arxiv("Hewitt et al. 2022, Truncation Sampling as Language Model Desmoothing (Findings of EMNLP)", "2210.15191")
_LLADA = _arxiv("Nie et al. 2025, Large Language Diffusion Models (LLaDA)", "2502.09992")
_DREAM = _arxiv("Ye et al. 2025, Dream 7B: Diffusion Large Language Models", "2508.15487")
_FAST_DLLM = _arxiv("Wu et al. 2025, Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling "
                    "KV Cache and Parallel Decoding", "2505.22618")
_SCHED = _arxiv("Mohamed et al. 2025, Fast-Decoding Diffusion Language Models via Progress-Aware "
                "Confidence Schedules (SchED)", "2512.02892")
_PROPHET = _arxiv("Li et al. 2025, Diffusion Language Models Know the Answer Before Decoding (Prophet)", "2508.19982")
_ASS = Paper("Taming Masked Diffusion Language Models via Consistency Trajectory Reinforcement Learning with "
             "Fewer Decoding Steps: EOS early rejection and the ascending step-size scheduler (authors' code)",
             "https://github.com/yjyddq/EOSER-ASS-RL")
_PC = _arxiv("Huang et al. 2025, PC-Sampler: Position-Aware Calibration of Decoding Bias in Masked "
             "Diffusion Models", "2508.13021")
_CREDIT = _arxiv("CreditDecoding: Accelerating Parallel Decoding in Diffusion Large Language Models with "
                 "Trace Credits (2025)", "2510.06133")
_TRANSFORMERS_GEN = Paper("Hugging Face transformers, text generation strategies",
                          "https://huggingface.co/docs/transformers/generation_strategies")

_LI_CD = _arxiv("Li et al. 2023, Contrastive Decoding: Open-ended Text Generation as Optimization (ACL)",
                "2210.15097")

PAPERS: dict[str, tuple[Paper, ...]] = {
    # sampling
    "greedy": (Paper("Greedy (argmax) decoding, the temperature-0 limit of sampling; see transformers' "
                     "generation strategies", _TRANSFORMERS_GEN.url),),
    "sample": (_arxiv("Holtzman et al. 2020, The Curious Case of Neural Text Degeneration (ICLR)", "1904.09751"),
               Paper("llama.cpp's sampler chain (the order and the rules of the processor chain)",
                     "https://github.com/ggml-org/llama.cpp")),
    "top_k": (_arxiv("Fan et al. 2018, Hierarchical Neural Story Generation (ACL)", "1805.04833"),),
    "top_p": (_arxiv("Holtzman et al. 2020, The Curious Case of Neural Text Degeneration (ICLR)", "1904.09751"),),
    "min_p": (_arxiv("Nguyen et al. 2024, Turning Up the Heat: Min-p Sampling for Creative and Coherent "
                     "LLM Outputs (ICLR 2025)", "2407.01082"),),
    "typical": (_arxiv("Meister et al. 2023, Locally Typical Sampling (TACL)", "2202.00666"),),
    "epsilon": (_HEWITT,),
    "eta": (_HEWITT,),
    "mirostat": (_arxiv("Basu et al. 2021, Mirostat: A Neural Text Decoding Algorithm that Directly Controls "
                        "Perplexity (ICLR)", "2007.14966"),),
    "xtc": (Paper("p-e-w 2024, Exclude Top Choices (XTC), text-generation-webui pull request #6335",
                  "https://github.com/oobabooga/text-generation-webui/pull/6335"),),
    # search
    "beam": (Paper("Lowerre 1976, The Harpy Speech Recognition System (PhD thesis, CMU)", None),
             _arxiv("Graves 2012, Sequence Transduction with Recurrent Neural Networks", "1211.3711"),
             _arxiv("Sutskever et al. 2014, Sequence to Sequence Learning with Neural Networks (NeurIPS)", "1409.3215"),
             _arxiv("Kasai et al. 2022, A Call for Clarity in Beam Search: How It Works and When It Stops "
                    "(patience; LREC-COLING 2024)", "2204.05424")),
    "best_first_beam": (Paper("Meister, Vieira & Cotterell 2020, Best-First Beam Search (TACL)",
                              "https://doi.org/10.1162/tacl_a_00346"),
                        _arxiv("Xu, Jonnalagadda & Durrett 2022, Massive-scale Decoding for Text Generation using "
                               "Lattices (NAACL; best-first search with recombination, the recombine knob)",
                               "2112.07660")),
    "uid_beam": (_arxiv("Meister, Cotterell & Vieira 2020, If Beam Search is the Answer, What was the Question? "
                        "(EMNLP)", "2010.02650"),),
    "diverse_beam": (_arxiv("Vijayakumar et al. 2018, Diverse Beam Search: Decoding Diverse Solutions from Neural "
                            "Sequence Models (AAAI)", "1610.02424"),),
    "arithmetic": (_arxiv("Vilnis et al. 2023, Arithmetic Sampling: Parallel Diverse Decoding for Large Language "
                          "Models (ICML)", "2210.15458"),),
    "best_of_n": (_arxiv("Adiwardana et al. 2020, Towards a Human-like Open-Domain Chatbot (sample-and-rank)",
                         "2001.09977"),),
    "adadec": (_arxiv("He et al. 2025, Towards Better Code Generation: Adaptive Decoding with Uncertainty Guidance "
                      "(AdaDec)", "2506.08980"),),
    "cntp": (_arxiv("Wang et al. 2025, Cautious Next Token Prediction (Findings of ACL)", "2507.03038"),),
    "mbr": (_arxiv("Eikema & Aziz 2020, Is MAP Decoding All You Need? The Inadequacy of the Mode in Neural "
                   "Machine Translation (COLING)", "2005.10283"),
            _arxiv("Freitag et al. 2023, Epsilon Sampling Rocks: Investigating Sampling Strategies for Minimum "
                   "Bayes Risk Decoding (Findings of EMNLP)", "2305.09860"),
            _arxiv("Vamvas & Sennrich 2024, Linear-time Minimum Bayes Risk Decoding with Reference Aggregation "
                   "(ACL)", "2402.04251"),
            Paper("Kumar & Byrne 2004, Minimum Bayes-Risk Decoding for Statistical Machine Translation (NAACL)",
                  "https://aclanthology.org/N04-1022/")),
    # contrastive
    "contrastive_search": (_arxiv("Su et al. 2022, A Contrastive Framework for Neural Text Generation (NeurIPS)",
                                  "2202.06417"),),
    "contrastive": (_LI_CD,
                    _arxiv("O'Brien & Lewis 2023, Contrastive Decoding Improves Reasoning in Large Language Models",
                           "2309.09117")),
    "dola": (_arxiv("Chuang et al. 2024, DoLa: Decoding by Contrasting Layers Improves Factuality in Large "
                    "Language Models (ICLR)", "2309.03883"),),
    "cfg": (_arxiv("Sanchez et al. 2023, Stay on topic with Classifier-Free Guidance (ICML 2024)", "2306.17806"),),
    "cad": (_arxiv("Shi et al. 2023, Trusting Your Evidence: Hallucinate Less with Context-aware Decoding "
                   "(NAACL 2024)", "2305.14739"),),
    "fsd": (_arxiv("Yang et al. 2023, A Frustratingly Simple Decoding Method for Neural Text Generation "
                   "(LREC-COLING 2024)", "2305.12675"),),
    "lookback": (_arxiv("Xu et al. 2023, Look-back Decoding for Open-Ended Text Generation (EMNLP)", "2305.13477"),),
    # speculative
    "speculative": (_LEVIATHAN, _CHEN,
                    _arxiv("Huang et al. 2024, SpecDec++: Boosting Speculative Decoding via Adaptive Candidate "
                           "Lengths (adaptive draft length)", "2405.19715")),
    "spec_tree": (_arxiv("Li et al. 2024, EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees",
                         "2406.16858"),
                  _arxiv("Chen et al. 2024, Sequoia: Scalable, Robust, and Hardware-aware Speculative Decoding",
                         "2402.12374"),
                  _arxiv("Miao et al. 2024, SpecInfer: Accelerating Generative LLM Serving with Tree-based "
                         "Speculative Inference and Verification (ASPLOS)", "2305.09781"),
                  _arxiv("Sun et al. 2023, SpecTr: Fast Speculative Decoding via Optimal Transport (NeurIPS)",
                         "2310.15141"),
                  _arxiv("Yang et al. 2024, Multi-Candidate Speculative Decoding", "2401.06706")),
    "spec_contrastive": (_arxiv("Yuan et al. 2023, Speculative Contrastive Decoding (ACL 2024)", "2311.08981"),
                         _LI_CD),
    "bandit_spec": (_arxiv("Hou et al. 2025, BanditSpec: Adaptive Speculative Decoding via Bandit Algorithms (ICML)",
                           "2505.15141"),),
    "prompt_lookup": (Paper("Saxena 2023, Prompt Lookup Decoding",
                            "https://github.com/apoorvumang/prompt-lookup-decoding"),
                      _arxiv("Ou et al. 2024, Lossless Acceleration of Large Language Model via Adaptive N-gram "
                             "Parallel Decoding (ANPD; NAACL industry track)", "2404.08698")),
    "ngram_adaptive": (_arxiv("Liu et al. 2024, Adaptive Draft-Verification for Efficient Large Language Model "
                              "Decoding (ADED; AAAI 2025)", "2407.12021"),),
    "token_recycling": (_arxiv("Luo et al. 2024, Turning Trash into Treasure: Accelerating Inference of Large "
                               "Language Models with Token Recycling (ACL 2025)", "2408.08696"),),
    "jacobi": (_arxiv("Santilli et al. 2023, Accelerating Transformer Inference for Translation via Parallel "
                      "Decoding (ACL)", "2305.10427"),),
    "lookahead": (_arxiv("Fu et al. 2024, Break the Sequential Dependency of LLM Inference Using Lookahead "
                         "Decoding (ICML)", "2402.02057"),),
    "layer_skip": (_arxiv("Elhoushi et al. 2024, LayerSkip: Enabling Early Exit Inference and Self-Speculative "
                          "Decoding (ACL)", "2404.16710"),
                   _arxiv("Zarch et al. 2025, DEL: Context-Aware Dynamic Exit Layer for Efficient "
                          "Self-Speculative Decoding", "2504.05598")),
    "mask_probe": (_arxiv("Goel et al. 2026, Efficient Training-Free Multi-Token Prediction via Embedding-Space "
                          "Probing", "2603.17942"),),
    # diffusion
    "llada": (_LLADA, Paper("LLaDA's reference sampler, generate.py", "https://github.com/ML-GSAI/LLaDA")),
    "dream": (_DREAM, Paper("Dream's reference sampler, generation_utils.py", "https://github.com/HKUNLP/Dream")),
    "fast_dllm": (_FAST_DLLM,),
    "sched": (_SCHED,),
    "prophet": (_PROPHET,),
    "pc_sampler": (_PC,),
    "credit": (_CREDIT,),
    "freedave": (_arxiv("Wu & Zhang 2025, Free Draft-and-Verification: Toward Lossless Parallel Decoding for "
                        "Diffusion Large Language Models (FreeDave)", "2510.00294"),),
    "masked_diffusion": (_LLADA, _DREAM, _FAST_DLLM, _SCHED, _PROPHET, _PC, _CREDIT, _ASS),
    "ete": (_arxiv("Fu et al. 2025, From Bits to Rounds: Parallel Decoding with Exploration for Diffusion "
                   "Language Models (ETE)", "2511.21103"),),
    "r2_dllm": (_arxiv("Du et al. 2026, R²-dLLM: Accelerating Diffusion Large Language Models via Spatio-Temporal "
                       "Redundancy Reduction", "2604.18995"),
                Paper("R²-dLLM's decoding rules, llada/generate.py", "https://github.com/GATECH-EIC/R2-dLLM")),
    "localleap": (_arxiv("Kong et al. 2025, Accelerating Diffusion LLM Inference via Local Determinism "
                         "Propagation (LocalLeap)", "2510.07081"),),
    "adablock": (_arxiv("Lu et al. 2025, AdaBlock-dLLM: Semantic-Aware Diffusion LLM Inference via Adaptive "
                        "Block Size", "2509.26432"),
                 Paper("AdaBlock-dLLM's block-length rule, llada/generate_adablock.py",
                       "https://github.com/lgxi24/AdaBlock-dLLM")),
    "ass": (_ASS,),
    # guided
    "constrained_beam": (_arxiv("Post & Vilar 2018, Fast Lexically Constrained Decoding with Dynamic Beam "
                                "Allocation for Neural Machine Translation (NAACL)", "1804.06609"),
                         _arxiv("Hokamp & Liu 2017, Lexically Constrained Decoding for Sequence Generation Using "
                                "Grid Beam Search (ACL)", "1704.07138")),
    "smc": (_arxiv("Lew et al. 2023, Sequential Monte Carlo Steering of Large Language Models using Probabilistic "
                   "Programs", "2306.03081"),
            _arxiv("Loula et al. 2025, Syntactic and Semantic Control of Large Language Models via Sequential "
                   "Monte Carlo (ICLR)", "2504.13139")),
    "watermark": (_arxiv("Kirchenbauer et al. 2023, A Watermark for Large Language Models (ICML)", "2301.10226"),),
    # collaboration
    "diffuspec": (_arxiv("Li et al. 2025, DiffuSpec: Unlocking Diffusion Language Models for Speculative Decoding",
                         "2510.02358"),),
    "ead": (_arxiv("Simonds et al. 2025, Entropy Adaptive Decoding: Dynamic Model Switching for Efficient "
                   "Inference", "2502.06833"),),
    "spec_cascade": (_arxiv("Narasimhan et al. 2024, Faster Cascades via Speculative Decoding (ICLR 2025)",
                            "2405.19261"),),
}

# Internal catalogue ids of the project's research notes ("A239", "seed paper A311"): they mean
# nothing to a reader of the public docs, so rendered text drops them.
_ID = r"A\d{3}(?:\s*/\s*A\d{3})*"
_INTERNAL = (
    re.compile(rf"\s*\((?:seed paper\s+)?{_ID}(?:\s+family)?\)"),   # " (A239)", " (seed paper A311)"
    re.compile(rf"\s*[,;]\s*{_ID}(?=\s*\))"),                         # "(Santilli et al. 2023, A028)"
    re.compile(rf"\s*\(\s*{_ID}\s*,\s*"),                             # "(A012, see ...)" -> keep the rest
    re.compile(rf"\s+{_ID}\b"),                                       # anything left
)


def scrub(text: str) -> str:
    """``text`` without the internal research-note ids (``A239``) a public doc must not cite."""
    for pat in _INTERNAL[:2]:
        text = pat.sub("", text)
    text = _INTERNAL[2].sub(" (", text)
    return _INTERNAL[3].sub("", text)


_ARXIV_ID = re.compile(r"arXiv:\s*(\d{4}\.\d{4,5})", re.IGNORECASE)


def papers_for(decoder: str, reference: str = "") -> tuple[Paper, ...]:
    """The sources of one decoder: its entry in :data:`PAPERS`; for a decoder not in the table
    yet, the arXiv ids its ``reference`` names (``arXiv:2510.02358``), cited by that reference."""
    if decoder in PAPERS:
        return PAPERS[decoder]
    ids = _ARXIV_ID.findall(reference or "")
    cite = scrub(_ARXIV_ID.sub("", reference or "").replace("()", "").strip(" ,;")) or decoder
    return tuple(_arxiv(cite, i) for i in ids)


def _link(p: Paper) -> str:
    return f"[{p.cite}]({p.url})" if p.url else p.cite


def markdown(decoder: str, reference: str = "") -> str:
    """The decoder's sources as markdown links joined by '; ' (the scrubbed reference if none)."""
    papers = papers_for(decoder, reference)
    return "; ".join(_link(p) for p in papers) if papers else scrub(reference)


def short_markdown(decoder: str, reference: str = "") -> str:
    """One source for the summary table, a linked one first (the decoder's section has them all)."""
    papers = papers_for(decoder, reference)
    if not papers:
        return scrub(reference)
    first = next((p for p in papers if p.url), papers[0])
    more = f" (+{len(papers) - 1})" if len(papers) > 1 else ""
    return _link(first) + more
