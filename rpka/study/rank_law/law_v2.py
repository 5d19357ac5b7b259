def write_law_v2(results, log=print):
    raise NotImplementedError
