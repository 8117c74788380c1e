"""A small GAN with the default Logic: two optimizers on one model, each on its own loss.

The model holds a generator and a discriminator and returns both losses from one forward.
The trainer gets two optimizers, and the Logic's ``optimizers`` option says which loss each
one steps on. With several losses, each is backpropagated to its own optimizer's parameters
only, so the generator's loss leaves no gradient on the discriminator and ``fake.detach()``
is needed only to save the work. Each optimizer has its own LR scheduler (an ``LRScheduler``
extension each) and, with ``--amp``, its own ``GradScaler``; snapshots hold all of them and a
second run with the same ``--out`` resumes.

The data is synthetic: points from a 2-D Gaussian the generator learns to imitate from noise.

Run it::

    python examples/train_gan.py --out result/gan --epochs 12
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import DataLoader

import ppe_core as ppe

E = ppe.training.extensions
TARGET_MEAN = (2.0, -1.0)
TARGET_STD = 0.5
NOISE = 4


class GAN(torch.nn.Module):
    """A generator (noise to points) and a discriminator (points to a real/fake logit)."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.gen = torch.nn.Sequential(
            torch.nn.Linear(NOISE, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2)
        )
        self.dis = torch.nn.Sequential(
            torch.nn.Linear(2, hidden),
            torch.nn.LeakyReLU(0.2),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(hidden, 1),
        )

    def forward(self, real: torch.Tensor, z: torch.Tensor) -> dict[str, torch.Tensor]:
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        fake = self.gen(z)
        d_real, d_fake = self.dis(real), self.dis(fake.detach())
        d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
        g_out = self.dis(fake)
        g_loss = bce(g_out, torch.ones_like(g_out))
        return {"g_loss": g_loss, "d_loss": d_loss}


def synthetic_data(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """``n`` real points and a noise vector for each."""
    g = torch.Generator().manual_seed(seed)
    real = torch.randn(n, 2, generator=g) * TARGET_STD + torch.tensor(TARGET_MEAN)
    z = torch.randn(n, NOISE, generator=g)
    return [{"real": real[i], "z": z[i]} for i in range(n)]


def mean_error(gan: GAN, n: int = 2000) -> float:
    """The distance between the generated points' mean and the target's."""
    with torch.no_grad():
        z = torch.randn(n, NOISE, generator=torch.Generator().manual_seed(123))
        fake = gan.gen(z.to(next(gan.parameters()).device)).float().cpu()
    return float((fake.mean(0) - torch.tensor(TARGET_MEAN)).norm())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="result/gan", help="output directory")
    parser.add_argument("--epochs", type=int, default=12, help="epochs to train in total")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    parser.add_argument("--amp", action="store_true", help="float16 autocast, a scaler each")
    parser.add_argument("--device", default=os.environ.get("PPE_DEVICE", "cpu"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    """Trains (or resumes), prints and returns the generated mean's error."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    loader: DataLoader[dict[str, torch.Tensor]] = DataLoader(
        synthetic_data(args.samples, args.seed),  # type: ignore[arg-type]
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    gan = ppe.to(GAN(), args.device)
    opt_g = torch.optim.Adam(gan.gen.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(gan.dis.parameters(), lr=2e-3, betas=(0.5, 0.999))

    # Which loss each optimizer steps on (both on the model "main", the default).
    targets: dict[str, dict[str, object]] = {"gen": {"loss": "g_loss"}, "dis": {"loss": "d_loss"}}
    options: dict[str, object] = {"optimizers": targets}
    if args.amp:
        device_type = torch.device(args.device).type
        options["autocast"] = {"dtype": torch.float16}
        for target in targets.values():
            target["grad_scaler"] = torch.amp.GradScaler(device_type)

    log_report = E.LogReport()
    snapshot = E.snapshot(autoload=True, n_retains=2)
    trainer = ppe.engine.create_trainer(
        gan,
        {"gen": opt_g, "dis": opt_d},
        args.epochs,
        device=args.device,
        out_dir=args.out,
        options=options,
        extensions=[
            log_report,
            # A scheduler per optimizer; named, so their states are easy to find in snapshots.
            ppe.training.ExtensionEntry(
                E.LRScheduler(torch.optim.lr_scheduler.ExponentialLR(opt_g, gamma=0.9)),
                name="lr_gen",
            ),
            ppe.training.ExtensionEntry(
                E.LRScheduler(torch.optim.lr_scheduler.StepLR(opt_d, step_size=4, gamma=0.5)),
                name="lr_dis",
            ),
            E.PrintReport(["epoch", "iteration", "train/d_loss", "train/g_loss"]),
            snapshot,
        ],
    )
    trainer.run(loader)

    if snapshot.loaded_from is not None:
        print(f"resumed from {snapshot.loaded_from}")
    error = mean_error(gan)
    print(f"generated mean error: {error:.4f} (epoch {trainer.epoch})")
    return error


if __name__ == "__main__":
    main()
