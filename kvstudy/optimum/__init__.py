"""The hindsight optimum of Jaillet et al. (Sec. 3, eqs. 1-4) and the instances it is measured on."""
