# torch_twins.py: gpusync-train's three models written in PyTorch, parameter for parameter in the
# same order as the trainer's flat buffer (nn.Module registration order), for the fixture that
# checks the trainer against PyTorch (fixtures/make_torch_steps.py) and for the benchmark against
# PyTorch (scripts/bench/trainer_torch.py). Every ReLU and max-pool goes through `watch`, which
# the fixture generator sets to see how close a run comes to a tie; the benchmark leaves it None.
import torch
import torch.nn as nn
import torch.nn.functional as F

watch = None  # called with ("relu", input) or ("pool", input) before each ReLU and max-pool


def relu(x):
    if watch:
        watch("relu", x)
    return F.relu(x)


def max_pool(x):
    if watch:
        watch("pool", x)
    return F.max_pool2d(x, 2)


class ReLU(nn.Module):
    def forward(self, x):
        return relu(x)


def mlp(hidden, dim=784, classes=10):
    """Linear+ReLU layers of `hidden` sizes, then Linear to the classes (the trainer's mlp)."""
    sizes, layers = [dim] + list(hidden), []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), ReLU()]
    return nn.Sequential(nn.Flatten(), *layers, nn.Linear(sizes[-1], classes))


class LeNet(nn.Module):
    """PyTorch's MNIST example as the seeds train it (lenet.c): conv 1->10 k5, max-pool, ReLU;
    conv 10->20 k5, dropout2d, max-pool, ReLU; fc 320->50, ReLU, dropout; fc 50->10."""

    def __init__(self, dropout=0.0, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, classes)
        self.p = dropout

    def forward(self, x):
        x = relu(max_pool(self.conv1(x)))
        x = relu(max_pool(F.dropout2d(self.conv2(x), self.p, self.training)))
        x = F.dropout(relu(self.fc1(x.flatten(1))), self.p, self.training)
        return self.fc2(x)


class Block(nn.Module):
    """A basic block: conv 3x3 (stride s), BN, ReLU, conv 3x3, BN, plus the shortcut (the input,
    or conv 1x1 stride s and BN where the shape changes), then ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(relu(self.bn1(self.conv1(x)))))
        return relu(y + (self.short(x) if self.short is not None else x))


class ResNet(nn.Module):
    """resnet.c's network: a 3x3 stem (16) with BN and ReLU, three stages of two basic blocks
    (16, 32, 64 channels; stages 2 and 3 start with stride 2), global average pool, fc."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for i in range(6):
            cout = (16, 32, 64)[i // 2]
            blocks.append(Block(cin, cout, 2 if i in (2, 4) else 1))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.blocks(relu(self.bn(self.stem(x))))
        return self.fc(x.mean(dim=(2, 3)))


def make(kind, hidden=(512, 256), dropout=0.0):
    """The twin of `gpusync-train --model KIND`; inputs are (N, 1, 28, 28) in [0, 1]."""
    if kind == "mlp":
        return mlp(hidden)
    if kind == "lenet":
        return LeNet(dropout)
    if kind == "resnet":
        return ResNet()
    raise ValueError(f"unknown model {kind}")
