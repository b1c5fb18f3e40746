"""Family ``contrastive``: decoders that pick a token by contrasting two views of the next
token - the candidate against its context (contrastive search), an expert model against an
amateur (contrastive decoding), a conditional pass against an unconditional one
(classifier-free guidance), the final layer against a premature one (DoLa).

One module per decoder; the shared evidence and helpers are in ``_common``.
"""
