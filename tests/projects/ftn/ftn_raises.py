def ftn_pytorch_train(x, target):
    raise RuntimeError("the training script failed on purpose")
