def log_single_rank(logger, *args, rank=0, **kwargs):
    logger.log(*args, **kwargs)
