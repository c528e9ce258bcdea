"""Measurement beside the programming model: what a step communicates and what it costs.

  communication  the account of a step's collectives (recorded by engine.collectives
                 as a step is traced), their bytes on the wire and their time alone
  transfers      the same for a parameter-server worker update: tensors pulled and pushed
  noise_scale    the gradient noise scale from per-replica and all-reduced gradient norms
  cost           parameter counts, FLOPs and gradient bytes of a model
  device_memory  what each device of a replica spanning devices holds (variables by
                 kind, from where they are), keeps (activations) and computes

Nothing here changes what a step computes; these modules import no other engine module.
"""
