"""A lithium-ion cell's single-particle model with electrolyte (SPMe) as an index-1 DAE, for `sciad bench dae`.

The model is the SPMe of Marquis, Sulzer, Timms, Please and Chapman, "An asymptotic derivation of a single
particle model with electrolyte", J. Electrochem. Soc. 166 (2019) A3693, written dimensionally, with the
LG M50 parameter set of Chen, Brosa Planella, O'Regan, Gastol, Widanage and Kendrick, "Development of
experimental techniques for parameterization of multi-scale lithium-ion battery models", J. Electrochem. Soc.
167 (2020) 080534 (graphite negative, NMC 811 positive, LiPF6 electrolyte by Nyman et al. 2008: PyBaMM's
"Chen2020"), 25 °C, a constant-current 1C (5 A) discharge from rest.

Differential states (nondimensional: each concentration over its maximum or the electrolyte's initial one):

- the lithium concentration s in one negative and one positive spherical particle, `shells` equal shells each
  (finite volumes): s_t = (D/R²) r⁻² (r² s_r)_r, zero flux at the centre, the molar flux j out of the surface
  uniform across each electrode (j_n = I R_n / (3 F ε_s,n L_n), j_p = −I R_p / (3 F ε_s,p L_p));
  surface value extrapolated from the outer shell with that flux;
- the electrolyte concentration c in `cells` cells in each of the negative electrode, separator and positive
  electrode: ε c_t = (D_e(c) ε^b c_x)_x + (1 − t⁺) a j (b = 1.5, Bruggeman), zero flux at both current
  collectors, face coefficients by harmonic averaging across the regions' porosities.

Algebraic states (M = 0 on their rows):

- the electrolyte potential φ_e in each cell: across each interior face, MacInnes's equation
  φ_{i+1} − φ_i = 2RT(1 − t⁺)/F (ln c_{i+1} − ln c_i) − i_e R_face / κ(c_face), the electrolyte current i_e
  known in the SPMe (I x / L_n in the negative electrode, I across the separator, I (L − x) / L_p in the
  positive one), and one equation that grounds it: the negative solid potential's average,
  −I L_n / (3 σ_n), equals mean_n(φ_e) + U_n(s_n,surf) + η_n;
- the reaction overpotentials η_n, η_p by Butler–Volmer with the x-averaged electrolyte concentration,
  2 j₀ sinh(F η / 2RT) = ±I / (a L) (α = 1/2), j₀ = m √(c_e c_s (c_max − c_s)) (implicit in η);
- the terminal voltage V = U_p(s_p,surf) + η_p + mean_p(φ_e) − I L_p / (3 σ_p).

Left out: the double layer, temperature (25 °C throughout), contact resistance; the solid potentials enter by
their electrode averages (the SPMe's leading order). At 1C the electrolyte reaches 2.08 c_e0 at the negative
current collector and 0.51 c_e0 at the positive one within 400 s (D_e(c) falls with c), the surface
stoichiometries stay in (0.05, 0.95) to 3,000 s, and V falls from 4.02 V at rest to 3.24 V (the curve in
`sciad bench dae`'s dae-battery.png, sciad and IDAS on top of each other).

The algebraic block's Jacobian is nonsingular (bidiagonal in φ_e plus the grounding row; cosh in η; 1 for V):
index 1. Every algebraic state is also explicit in the differential ones (`consistent`): the consistent
initial values in closed form, and the voltage as a function of the differential states for a loss that
IDAS's adjoint can seed.

Parameters θ (5): ln D_n, ln D_p (particle diffusivities, m²/s), ln m_n, ln m_p (the reaction-rate constants
of j₀, A m⁻² (m³/mol)^1.5) and the log of a factor on the electrolyte diffusivity D_e(c).

One definition serves sciad (jax.numpy) and IDAS (CasADi's symbols): the model's arithmetic goes through a
namespace `xp` (`namespace("jax")`, `namespace("casadi")`) of the few functions it needs.
"""

import dataclasses
import functools
import types

import numpy as np

F, R_GAS, T = 96485.33212, 8.314462618, 298.15
THERMAL = R_GAS * T / F  # V

# Chen 2020 (LG M50), SI units
L_N, L_S, L_P = 85.2e-6, 12e-6, 75.6e-6
R_N, R_P = 5.86e-6, 5.22e-6
EPS_N, EPS_S, EPS_P = 0.25, 0.47, 0.335  # electrolyte volume fractions
ACTIVE_N, ACTIVE_P = 0.75, 0.665  # active-material volume fractions
CMAX_N, CMAX_P = 33133.0, 63104.0
C_E0 = 1000.0
SIGMA_N, SIGMA_P = 215.0, 0.18
T_PLUS = 0.2594
BRUGGEMAN = 1.5
AREA = 0.065 * 1.58  # electrode height × width, m²
CAPACITY = 5.0  # A h
THETA = np.log([3.3e-14, 4e-15, 6.48e-7, 3.42e-6, 1.0])
S_N0, S_P0 = 29866.0 / CMAX_N, 17038.0 / CMAX_P


def _jax():
    import jax.numpy as jnp

    return types.SimpleNamespace(
        exp=jnp.exp,
        log=jnp.log,
        tanh=jnp.tanh,
        sqrt=jnp.sqrt,
        sinh=jnp.sinh,
        arcsinh=jnp.arcsinh,
        concat=jnp.concatenate,
        stack=jnp.stack,
        cumsum=jnp.cumsum,
        sum=jnp.sum,
        const=jnp.asarray,
    )


def _casadi():
    import casadi as ca

    return types.SimpleNamespace(
        exp=ca.exp,
        log=ca.log,
        tanh=ca.tanh,
        sqrt=ca.sqrt,
        sinh=ca.sinh,
        arcsinh=ca.asinh,
        concat=lambda vs: ca.vertcat(*vs),
        stack=lambda vs: ca.vertcat(*vs),
        cumsum=ca.cumsum,
        sum=ca.sum1,
        const=lambda a: ca.DM(np.asarray(a, float)),
    )


def graphite_ocp(s, xp):
    """U_n(s), V (Chen 2020)."""
    return (
        1.9793 * xp.exp(-39.3631 * s)
        + 0.2482
        - 0.0909 * xp.tanh(29.8538 * (s - 0.1234))
        - 0.04478 * xp.tanh(14.9159 * (s - 0.2769))
        - 0.0205 * xp.tanh(30.4444 * (s - 0.6103))
    )


def nmc_ocp(s, xp):
    """U_p(s), V (Chen 2020)."""
    return (
        -0.8090 * s
        + 4.4875
        - 0.0428 * xp.tanh(18.5138 * (s - 0.5542))
        - 17.7326 * xp.tanh(15.7890 * (s - 0.3117))
        + 17.5842 * xp.tanh(15.9308 * (s - 0.3120))
    )


def electrolyte_diffusivity(c):
    """D_e, m²/s, of c = c_e / 1,000 mol m⁻³ (Nyman et al. 2008)."""
    return 8.794e-11 * c**2 - 3.972e-10 * c + 4.862e-10


def electrolyte_conductivity(c):
    """κ, S/m, of c = c_e / 1,000 mol m⁻³ (Nyman et al. 2008)."""
    return 0.1297 * c**3 - 2.51 * c**1.5 + 3.329 * c


@dataclasses.dataclass(frozen=True)
class SPMe:
    """The SPMe at `shells` shells per particle and `cells` electrolyte cells per region, discharged at
    `c_rate` C: states u = (s_n, s_p, c | φ_e, η_n, η_p, V), 2 shells + 6 cells + 3."""

    shells: int = 40
    cells: int = 30
    c_rate: float = 1.0

    @property
    def current(self) -> float:
        """The applied current density I, A/m² (positive on discharge)."""
        return self.c_rate * CAPACITY / AREA

    @property
    def differential(self) -> int:
        return 2 * self.shells + 3 * self.cells

    @property
    def states(self) -> int:
        return self.differential + 3 * self.cells + 3

    @property
    def mass_matrix(self) -> np.ndarray:
        return np.concatenate([np.ones(self.differential), np.zeros(self.states - self.differential)])

    @property
    def x0(self) -> np.ndarray:
        """The differential states at rest: uniform particles and electrolyte."""
        return np.concatenate([np.full(self.shells, S_N0), np.full(self.shells, S_P0), np.ones(3 * self.cells)])

    # --- geometry -------------------------------------------------------------------------------

    def _shells(self):
        """Shell volumes / R³ and face areas / R² (interior faces, then the surface)."""
        faces = np.arange(self.shells + 1) / self.shells
        return np.diff(faces**3) / 3, faces[1:] ** 2

    def _cells(self):
        """Cell widths, porosities, face resistances Δx/(2ε^b) summed over each interior face's two cells,
        the electrolyte current / I at the interior faces and the reaction source / (I / F) in each cell."""
        n = self.cells
        width = np.repeat([L_N / n, L_S / n, L_P / n], n)
        eps = np.repeat([EPS_N, EPS_S, EPS_P], n)
        half = width / (2 * eps**BRUGGEMAN)
        x = np.cumsum(width)[:-1]
        current = np.clip(np.minimum(x / L_N, (L_N + L_S + L_P - x) / L_P), 0.0, 1.0)
        source = np.repeat([1 / L_N, 0.0, -1 / L_P], n)
        return width, eps, half[:-1] + half[1:], current, source

    # --- the model -------------------------------------------------------------------------------

    def _split(self, x):
        n, m = self.shells, self.cells
        return x[:n], x[n : 2 * n], x[2 * n : 2 * n + 3 * m]

    def _particle(self, s, D, radius, active, cmax, sign, xp):
        """(s_t, the surface concentration) of one particle: the molar flux out of its surface is
        sign · I R / (3 F ε_s L)."""
        volume, area = self._shells()
        length = L_N if sign > 0 else L_P
        flux = sign * self.current * radius / (3 * F * active * length) / cmax * radius  # j R / c_max, m²/s
        gradient = (s[1:] - s[:-1]) * self.shells  # ds/dr̂ at the interior faces
        inner = xp.concat([xp.const(np.zeros(1)), D * xp.const(area[:-1]) * gradient])  # into each shell
        outer = xp.concat([D * xp.const(area[:-1]) * gradient, xp.const(np.full(1, -flux))])  # through its outer face
        s_t = (outer - inner) / (xp.const(volume) * radius**2)
        return s_t, s[-1] - flux / (2 * self.shells * D)

    def _electrolyte(self, c, De_factor, xp):
        """c_t of the electrolyte cells."""
        width, eps, resistance, _, source = self._cells()
        face = (c[1:] + c[:-1]) / 2
        flux = -De_factor * electrolyte_diffusivity(face) * (c[1:] - c[:-1]) / xp.const(resistance)
        zero = xp.const(np.zeros(1))
        divergence = xp.concat([flux, zero]) - xp.concat([zero, flux])
        reaction = (1 - T_PLUS) * self.current / (F * C_E0) * xp.const(source * width)
        return (reaction - divergence) / xp.const(eps * width)

    def _potential_steps(self, c, xp):
        """φ_{i+1} − φ_i across each interior face (MacInnes with the SPMe's known electrolyte current)."""
        _, _, resistance, current, _ = self._cells()
        face = (c[1:] + c[:-1]) / 2
        logc = xp.log(c)
        return 2 * THERMAL * (1 - T_PLUS) * (logc[1:] - logc[:-1]) - self.current * xp.const(
            current * resistance
        ) / electrolyte_conductivity(face)

    def _kinetics(self, c_mean, s_surf, m, cmax, active, radius, length, xp):
        """The Butler–Volmer ratio I / (a L) / (2 j₀) of one electrode (its sign left to the caller)."""
        j0 = m * cmax * xp.sqrt(C_E0 * c_mean * s_surf * (1 - s_surf))
        return self.current * radius / (3 * active * length) / (2 * j0)

    def _common(self, x, theta, xp):
        s_n, s_p, c = self._split(x)
        D_n, D_p, m_n, m_p, De_factor = (xp.exp(theta[k]) for k in range(5))
        sn_t, sn_surf = self._particle(s_n, D_n, R_N, ACTIVE_N, CMAX_N, 1.0, xp)
        sp_t, sp_surf = self._particle(s_p, D_p, R_P, ACTIVE_P, CMAX_P, -1.0, xp)
        m = self.cells
        c_n, c_p = xp.sum(c[:m]) / m, xp.sum(c[2 * m :]) / m
        return dict(
            rates=xp.concat([sn_t, sp_t, self._electrolyte(c, De_factor, xp)]),
            steps=self._potential_steps(c, xp),
            ground=-self.current * L_N / (3 * SIGMA_N) - graphite_ocp(sn_surf, xp),
            positive=nmc_ocp(sp_surf, xp) - self.current * L_P / (3 * SIGMA_P),
            ratio_n=self._kinetics(c_n, sn_surf, m_n, CMAX_N, ACTIVE_N, R_N, L_N, xp),
            ratio_p=self._kinetics(c_p, sp_surf, m_p, CMAX_P, ACTIVE_P, R_P, L_P, xp),
        )

    def equations(self, x, z, theta, xp):
        """(the differential states' rates, the algebraic residuals) in namespace `xp`; x, z, theta vectors."""
        q = self._common(x, theta, xp)
        m = 3 * self.cells
        phi, eta_n, eta_p, V = z[:m], z[m], z[m + 1], z[m + 2]
        mean_n, mean_p = xp.sum(phi[: self.cells]) / self.cells, xp.sum(phi[2 * self.cells :]) / self.cells
        alg = xp.concat(
            [
                phi[1:] - phi[:-1] - q["steps"],
                xp.stack(
                    [
                        mean_n + eta_n - q["ground"],
                        xp.sinh(eta_n / (2 * THERMAL)) - q["ratio_n"],
                        xp.sinh(eta_p / (2 * THERMAL)) + q["ratio_p"],
                        V - q["positive"] - eta_p - mean_p,
                    ]
                ),
            ]
        )
        return q["rates"], alg

    def consistent(self, x, theta, xp):
        """The algebraic states (φ_e, η_n, η_p, V) in closed form from the differential ones."""
        q = self._common(x, theta, xp)
        n = self.cells
        eta_n = 2 * THERMAL * xp.arcsinh(q["ratio_n"])
        eta_p = -2 * THERMAL * xp.arcsinh(q["ratio_p"])
        rise = xp.concat([xp.const(np.zeros(1)), xp.cumsum(q["steps"])])
        phi = rise + (q["ground"] - eta_n - xp.sum(rise[:n]) / n)
        V = q["positive"] + eta_p + xp.sum(phi[2 * n :]) / n
        return xp.concat([phi, xp.stack([eta_n, eta_p, V])])

    def rhs(self, u, theta, t):
        """sciad's f(u, θ, t) = (rates, residuals) for M u' = f."""
        xp = namespace("jax")
        rates, alg = self.equations(u[: self.differential], u[self.differential :], theta, xp)
        return xp.concat([rates, alg])


@functools.cache
def namespace(kind: str):
    """The model's arithmetic for "jax" (jax.numpy) or "casadi" (CasADi's symbols)."""
    return {"jax": _jax, "casadi": _casadi}[kind]()
