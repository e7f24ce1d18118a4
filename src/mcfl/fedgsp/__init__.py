"""FedGSP's metrics, CPD and the time-cost model (:mod:`~mcfl.fedgsp.metrics`), shared by its
algorithm (:mod:`mcfl.algorithms.fedgsp`) and its paper's tables (:mod:`mcfl.papers.fedgsp`)."""
