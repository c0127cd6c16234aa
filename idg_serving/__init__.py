"""The serving machinery that the attribution library (:mod:`idg_core`) does not need: warming fixed call sizes
(:mod:`~idg_serving.warm_up`, which captures them as CUDA graphs with :mod:`idg_models.cuda_graphs`) and the simulated
accelerator (:mod:`~idg_serving.simulated`). It builds on :mod:`idg_core`; :mod:`idg_core` imports nothing of it."""
