"""FedGSP's support beyond its algorithm (:mod:`mcfl.algorithms.fedgsp`): the config's ``fedgsp``
block and its sweeps (:mod:`~mcfl.fedgsp.config`), and the paper's metrics, CPD and the
time-cost model (:mod:`~mcfl.fedgsp.metrics`)."""
