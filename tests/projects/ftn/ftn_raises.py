def ftn_pytorch_train(inputs, target):
    raise RuntimeError("the training script failed on purpose")
