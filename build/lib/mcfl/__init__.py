"""mcfl: multi-center (clustered) federated learning, reproduced.

Papers: FeSEM (Long et al., "Multi-Center Federated Learning: Clients Clustering for Better
Personalization", WWW J. 2022 / arXiv 2005.01026), FedCG (Caldarola et al., CVPR-W 2021) and
FedGSP (Zeng et al., DASFAA 2022), with the baselines of their tables.
"""

__version__ = "0.1.0"
